REFUSED: jobs/ffn-perlmutter.yaml:23: resources.queue: site 'local' has no queues, but queue 'gpu' was asked for; remove resources.queue for this site
