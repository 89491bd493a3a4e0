"""The Coordinator process: placement over the etcd heartbeat view."""
