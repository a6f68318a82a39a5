#!/nonexistent/interpreter
echo 1
