"""`omni-pd launch`: plan, start, supervise and route a PD deployment."""
