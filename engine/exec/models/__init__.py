"""Model implementations that read and write the paged KV pool."""
