package cli

import (
	"flag"
	"net"
	"net/url"
	"strconv"
	"strings"

	"github.com/outboxrelay/relay/internal/pgconfig"
	"github.com/outboxrelay/relay/relay"
)

// cloudEventsFlags are relay run's flags for CloudEvents; per-topic modes
// come from the config file's topics (cloudevents: off|binary|structured).
type cloudEventsFlags struct {
	mode       string
	source     string
	dataSchema string
}

func (c *cloudEventsFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&c.mode, "cloudevents", relay.CloudEventsOff, "present events as CloudEvents 1.0 (Kafka binding): off, binary (ce_* headers, payload untouched) or structured (a JSON payload wrapped in the CloudEvents JSON envelope; anything else goes to the dead letters); per topic: cloudevents in the config file's topics")
	fs.StringVar(&c.source, "cloudevents-source", "", "the ce_source attribute (default postgresql://<host>:<port>/<database>/<schema>, without user or password)")
	fs.StringVar(&c.dataSchema, "cloudevents-dataschema-url", "", "base URL of the schema registry as consumers reach it: ce_dataschema is <url>/schemas/ids/<id> for events a schema contract checks (default http://<--http-addr> with --schema-registry)")
}

func (c *cloudEventsFlags) validate() error {
	if err := relay.ValidCloudEventsMode(c.mode); err != nil {
		return usagef("--cloudevents: %v", err)
	}
	if c.source != "" {
		if _, err := url.Parse(c.source); err != nil {
			return usagef("--cloudevents-source %q: not a URI reference", c.source)
		}
	}
	if c.dataSchema != "" {
		if u, err := url.Parse(c.dataSchema); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return usagef("--cloudevents-dataschema-url %q: an http or https URL is expected", c.dataSchema)
		}
	}
	return nil
}

// config is the relay's CloudEvents configuration: the flags, the config
// file's per-topic modes, and the defaults of the source (from the
// database URL and schema) and the dataschema URL.
func (f *runFlags) cloudEventsConfig() (relay.CloudEvents, error) {
	c := f.cloudEvents
	ce := relay.CloudEvents{Mode: c.mode, Source: c.source, SchemaURL: c.dataSchema}
	if f.file != nil {
		for _, t := range f.file.Topics {
			if t.CloudEvents != "" {
				if ce.Topics == nil {
					ce.Topics = map[string]string{}
				}
				ce.Topics[t.Name] = t.CloudEvents
			}
		}
	}
	if ce.Source == "" {
		cfg, err := pgconfig.ParseConfig(f.db.url)
		if err != nil {
			return ce, err
		}
		ce.Source = defaultCloudEventsSource(cfg.Host, cfg.Port, cfg.Database, f.db.schema)
	}
	if ce.SchemaURL == "" && f.schemaRun.registry {
		scheme := "http"
		if f.httpTLS != (serverTLSFlags{}) {
			scheme = "https"
		}
		ce.SchemaURL = scheme + "://" + f.httpAddr
	}
	return ce, nil
}

// defaultCloudEventsSource names the outbox: the server, its database and
// the schema, and never the user or password. A Unix socket directory is
// left out of the URI (postgresql:///<database>/<schema>).
func defaultCloudEventsSource(host string, port uint16, database, schema string) string {
	u := url.URL{Scheme: "postgresql", Path: "/" + database + "/" + schema}
	if host != "" && !strings.HasPrefix(host, "/") {
		u.Host = net.JoinHostPort(host, strconv.Itoa(int(port)))
	}
	return u.String()
}
