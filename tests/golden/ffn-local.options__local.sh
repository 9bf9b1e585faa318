REFUSED: --set resources.exclusive=true: resources.exclusive: site 'local' (local) has no per-job exclusive; remove resources.exclusive for this site
