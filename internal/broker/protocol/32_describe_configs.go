package protocol

import (
	"fmt"
	"slices"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxrelay/relay/internal/broker"
)

// handleDescribeConfigs describes topics' configs (all, or the names
// asked) and, for tools that ask, the broker's (none: its settings are the
// relay's flags). A config equal to the broker's default is reported with
// the default source, any other as a topic override; with synonyms (v1+)
// and documentation (v3+) when asked.
func (s *Server) handleDescribeConfigs(req *kmsg.DescribeConfigsRequest, resp *kmsg.DescribeConfigsResponse) {
	defaults := topicConfigEntries(s.b.DefaultTopicConfig())
	for _, rr := range req.Resources {
		r := kmsg.NewDescribeConfigsResponseResource()
		r.ResourceType, r.ResourceName = rr.ResourceType, rr.ResourceName
		fail := func(code int16, err error) {
			r.ErrorCode = code
			msg := err.Error()
			r.ErrorMessage = &msg
		}
		switch rr.ResourceType {
		case kmsg.ConfigResourceTypeBroker:
		case kmsg.ConfigResourceTypeTopic:
			ti, err := s.b.Topic(rr.ResourceName)
			if err != nil {
				fail(broker.KafkaErrorCode(err), err)
				break
			}
			for i, e := range topicConfigEntries(ti.Config) {
				if rr.ConfigNames != nil && !slices.Contains(rr.ConfigNames, e.name) {
					continue
				}
				c := kmsg.NewDescribeConfigsResponseResourceConfig()
				v := e.value
				c.Name, c.Value, c.ConfigType = e.name, &v, e.ctype
				c.Source, c.IsDefault = kmsg.ConfigSourceDynamicTopicConfig, false
				if e.value == defaults[i].value {
					c.Source, c.IsDefault = kmsg.ConfigSourceDefaultConfig, true
				}
				if req.IncludeSynonyms {
					syn := kmsg.NewDescribeConfigsResponseResourceConfigConfigSynonym()
					syn.Name, syn.Value, syn.Source = e.name, &v, c.Source
					c.ConfigSynonyms = append(c.ConfigSynonyms, syn)
				}
				if req.IncludeDocumentation {
					doc := topicConfigDocs[e.name]
					c.Documentation = &doc
				}
				r.Configs = append(r.Configs, c)
			}
		case kmsg.ConfigResourceTypeGroupConfig:
			s.share.describeConfigs(rr, &r)
		default:
			fail(kerr.InvalidRequest.Code, fmt.Errorf("resource type %d: the embedded broker describes topics, groups and brokers", rr.ResourceType))
		}
		resp.Resources = append(resp.Resources, r)
	}
}
