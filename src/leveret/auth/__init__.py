"""Users, passwords and permissions: who may connect, and what they may touch."""
