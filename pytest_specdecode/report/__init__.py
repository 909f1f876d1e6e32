"""Where a run is reported: terminal, Markdown, HTML, plots and the plan."""
