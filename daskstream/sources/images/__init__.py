"""Folders of JPEG and PNG images read as one array: the folder, its files and labels, decoding and reads."""
