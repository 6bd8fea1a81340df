"""The NVML surface of the fake hardware: our NVML-compatible library and the state it reads."""
