"""What the machine has: GPUs, RAM, CPU, memory bandwidth, and a list of common consumer GPUs."""
