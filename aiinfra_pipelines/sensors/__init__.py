"""Sensors that keep the loop turning as new data lands."""
