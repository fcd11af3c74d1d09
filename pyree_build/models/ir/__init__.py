"""The program as IREE sees it: import, the one reading of a program, its op groups."""
