"""blockx_server: the processes of BlockX (grpclib servers and their IO adapters).

Adapters here are thin: they read the clock, call a ``blockx_core`` engine, and
perform the commands it returns.
"""
