# A stand-in GPU worker for tests without a GPU: speaks the worker's line protocol (a heartbeat,
# then one answer per job) and answers every job at once with no tests.
while read -r line; do
  echo '{"heartbeat":true}'
  echo '{"tests":[],"timing":null,"cuda_error":null,"load_error":null,"gpu":null}'
done
