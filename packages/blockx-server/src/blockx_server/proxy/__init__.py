"""blockx-proxy: one Unix socket in front of coordinators, workers and the Sync Invoker."""
