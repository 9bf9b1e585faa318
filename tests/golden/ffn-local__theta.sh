REFUSED: jobs/ffn-local.yaml:49: resources.nodes: 1 nodes requested but queue 'default' of site 'theta' needs at least 128
