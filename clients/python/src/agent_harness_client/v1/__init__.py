"""Generated from proto/agent_harness/v1 by generate.py: do not edit."""
