"""Precision sources, strongest first (DESIGN.md): plan requests, markers, the code's own typing,
autocast rules, default. Each source decides only nodes no stronger source decided."""
