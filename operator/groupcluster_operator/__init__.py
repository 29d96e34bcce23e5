"""groupcluster_operator: the kopf operator for GroupCluster resources."""
