"""Speed and memory of the release and its parts, optionally paired against another git revision."""
