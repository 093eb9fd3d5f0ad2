"""Core: typed records, profiles, the cost model, errors and stable hashes — what every layer uses."""
