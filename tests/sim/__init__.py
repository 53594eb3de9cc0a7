"""The deterministic simulator of one replicated file on 2-5 hosts (see world.py)."""
