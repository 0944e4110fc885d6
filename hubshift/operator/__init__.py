"""The control loop that sets replica counts and partition assignments, and its two runtimes."""
