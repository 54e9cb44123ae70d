"""runnerctl: a fair, safe GPU cluster from shared multi-GPU servers and GitLab CI runners."""

__version__ = "0.1.0"
