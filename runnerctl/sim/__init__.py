"""Simulated parts for the demo, the simulator and tests: GitLab's runner and job API."""
