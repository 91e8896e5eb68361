"""Cloud instances that configure themselves at first boot, and where nodes download from.

``sources`` resolves the one set of download settings (a mirror preset plus overrides) into the
roles' variables; ``userdata`` renders cloud-init user data that runs ``site.yml`` on the new
instance itself and leaves a ready marker with the verdict of its own ``gpuenv check``.
"""
