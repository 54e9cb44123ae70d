"""gitlab-runner custom executor drivers (installed as `runnerctl.executors`).

`contract` is the wire protocol with gitlab-runner and the one place that says how
config.toml invokes the drivers.
"""
