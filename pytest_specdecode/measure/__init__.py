"""Where a measurement is taken: the load generator, the server's metrics, the experiment."""
