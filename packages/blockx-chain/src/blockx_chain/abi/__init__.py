"""ABIs: the registry's entries (``spec``, light) and the decoder (``decoder``, which
loads the ABI library: import it only where logs are decoded)."""
