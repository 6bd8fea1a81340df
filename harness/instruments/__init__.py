"""What every layer records with and waits on: the timeline, gRPC interceptors and helpers, fault
plans, file watches.
"""
