"""Scripts run by a vendor's Python (`python rknn_driver.py JOB.json`); quantscan never imports them."""
