"""The simulated fleet: highway-env drives, image degradations, vehicle-side triggers."""
