"""Where a run is recorded: results.json, stored runs, redaction of secrets."""
