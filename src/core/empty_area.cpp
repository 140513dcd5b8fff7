// Stands in for an area of src/ that has no source file yet, so its library still builds.
