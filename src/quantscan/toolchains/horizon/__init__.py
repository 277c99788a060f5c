"""Horizon hb_mapper: its checker and makertbin logs."""
