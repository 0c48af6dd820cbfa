"""A client channel's states, shared by the channel and its consumers."""

OPENING = 0
OPEN = 1
RECOVERING = 2
CLOSED = 3
