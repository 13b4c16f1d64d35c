"""oleo benchmark harness (entry point: bench/run). See bench/README.md."""
