"""Pydantic models: job config, dataset schema, manifest (frozen; errors name the field)."""
