"""What a checkpoint is, apart from where it lives: its manifest (format, parts, tree hash), the
safetensors header, scanning a directory, hashing, building and verifying a manifest, the diff of two
manifests, and the names and units they are written in. Nothing here knows about tiers.

Imports nothing on import (``tiering.parse_size`` must stay cheap); the modules are the API.
"""
