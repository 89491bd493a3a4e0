"""The Sync Invoker process: run one function synchronously."""
