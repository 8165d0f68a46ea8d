"""Storage: local and gs:// paths, and publishing a release safely."""
