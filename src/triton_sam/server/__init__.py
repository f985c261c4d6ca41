"""The server side: Triton python models and `triton-sam serve` (a local Triton server)."""
