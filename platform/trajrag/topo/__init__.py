"""topo stage."""
