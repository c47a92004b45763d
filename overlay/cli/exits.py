"""The exit codes outside the error contract (DESIGN: 0 done, 1 partial, 2 could not
run, 3 usage come from ``RewindfsError.exit_code``), as shells and git have them."""

EXIT_INTERRUPTED = 130      # 128 + SIGINT
EXIT_PIPE_CLOSED = 141      # 128 + SIGPIPE
