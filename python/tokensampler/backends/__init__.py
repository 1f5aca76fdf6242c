"""One backend per file; `tokensampler.create_backend` picks one by name."""
