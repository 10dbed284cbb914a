package pgcluster

import (
	"context"
	"errors"
	"fmt"
	"sort"

	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/modules/postgres"
)

// containerImage is the server image used when no local binaries exist.
const containerImage = "postgres:15-alpine"

// dockerAvailable reports whether a Docker engine answers. testcontainers-go
// panics in some set-ups without an engine, so a panic counts as "no".
func dockerAvailable(ctx context.Context) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("no Docker engine answers: %v", r)
		}
	}()
	provider, err := testcontainers.ProviderDefault.GetProvider()
	if err != nil {
		return fmt.Errorf("no Docker engine answers: %w", err)
	}
	defer provider.Close()
	if err := provider.Health(ctx); err != nil {
		return fmt.Errorf("no Docker engine answers: %w", err)
	}
	return nil
}

func startContainer(ctx context.Context, opts Options) (*Cluster, error) {
	s := settings(opts)
	names := make([]string, 0, len(s))
	for name := range s {
		names = append(names, name)
	}
	sort.Strings(names)
	cmd := []string{"postgres"}
	for _, name := range names {
		cmd = append(cmd, "-c", name+"="+s[name])
	}
	ctr, err := postgres.Run(ctx, containerImage,
		postgres.WithDatabase("postgres"),
		postgres.WithUsername("postgres"),
		postgres.WithPassword("postgres"),
		testcontainers.WithCmd(cmd...),
		postgres.BasicWaitStrategies(),
	)
	if err != nil {
		if ctr != nil {
			err = errors.Join(err, testcontainers.TerminateContainer(ctr))
		}
		return nil, fmt.Errorf("pgcluster: starting a PostgreSQL container: %w", err)
	}
	url, err := ctr.ConnectionString(ctx, "sslmode=disable")
	if err != nil {
		return nil, errors.Join(fmt.Errorf("pgcluster: %w", err), testcontainers.TerminateContainer(ctr))
	}
	return &Cluster{
		kind: KindContainer,
		url:  url,
		stop: func(context.Context) error { return testcontainers.TerminateContainer(ctr) },
	}, nil
}
