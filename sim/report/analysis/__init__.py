"""What is made of replays and measurements: validation reports (predicted against
measured) and calibration (fitting the cost model's device parameters to measured runs)."""
