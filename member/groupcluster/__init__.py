"""groupcluster: group communication and a data grid for Python."""
