"""KEP5970: the seven behaviours of kubernetes/enhancements#5970, judged through the Kubernetes API only."""
