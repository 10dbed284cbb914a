// Package devcli is the development binary's own commands: `relay-dev
// demo` runs everything on embedded defaults, `relay-dev bench` measures
// the relay against its baseline. Both start a throwaway PostgreSQL
// (internal/pgcluster: the local binaries, or Docker through
// testcontainers), a harness the production binary must not carry, so
// they live here and cmd/relay-dev adds them to the relay's own commands
// (internal/cli).
package devcli

import "github.com/outboxrelay/relay/internal/cli"

// Commands are relay-dev's commands beside the relay's.
func Commands() []cli.Command {
	return []cli.Command{
		{Name: "demo", Summary: "everything on embedded defaults: Postgres, relay, a sample service and a Kafka consumer", Run: runDemo},
		{Name: "bench", Summary: "measure the relay end to end against its baseline", Run: runBench, Subcommands: []cli.Command{
			{Name: "broker", Summary: "measure the embedded broker alone: fill a data directory, then time its open"},
			{Name: "bigtx", Summary: "one large transaction through the WAL reader, with and without streaming"},
		}},
	}
}
