echo "demo: not yet"
