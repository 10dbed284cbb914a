// Command relay-dev is the relay with its development harness: every
// `relay` command, and `demo` and `bench` (internal/devcli), which start a
// throwaway PostgreSQL. It is not the binary to deploy: cmd/relay is.
package main

import (
	"os"

	"github.com/outboxrelay/relay/internal/cli"
	"github.com/outboxrelay/relay/internal/devcli"
)

func main() {
	os.Exit(cli.MainWith("relay-dev", devcli.Commands(), os.Args[1:], cli.IO{Stdout: os.Stdout, Stderr: os.Stderr}))
}
