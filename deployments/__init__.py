"""How lexiflow runs in production: Prefect deployments (`definitions`) and one-box operation (`serve`)."""
