// Command pubsub-emulator runs Google's in-memory Pub/Sub fake (pstest, from the Go client
// library) on a fixed address for bucketfs's `--notify pubsub://` tests, creates the topic
// and subscriptions they use, and takes test messages over HTTP:
//
//	pubsub-emulator -addr 127.0.0.1:8085 -http 127.0.0.1:8086 -project p -topic t -subs s1,s2
//	curl -X POST 'http://127.0.0.1:8086/publish?topic=t' -d '{"data": "<base64>", "attributes": {...}}'
//
// fake-gcs-server started with PUBSUB_EMULATOR_HOST=127.0.0.1:8085 publishes GCS's
// notifications to the topic; the HTTP door lets a test publish crafted ones (duplicates,
// late or out-of-order events) to the same topic.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8085", "gRPC address of the fake")
	httpAddr := flag.String("http", "", "address of the HTTP door for test messages (none if empty)")
	project := flag.String("project", "bucketfs-test", "project of the topic and subscriptions")
	topic := flag.String("topic", "gcs-events", "topic to create")
	subs := flag.String("subs", "", "comma-separated subscriptions to create on the topic")
	flag.Parse()

	srv := pstest.NewServerWithAddress(*addr)
	defer srv.Close()
	conn, err := grpc.NewClient(srv.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		log.Fatalf("connect to the fake: %v", err)
	}
	ctx := context.Background()
	topicName := fmt.Sprintf("projects/%s/topics/%s", *project, *topic)
	if _, err := pubsubpb.NewPublisherClient(conn).CreateTopic(ctx, &pubsubpb.Topic{Name: topicName}); err != nil {
		log.Fatalf("create topic %s: %v", topicName, err)
	}
	for _, s := range strings.Split(*subs, ",") {
		if s == "" {
			continue
		}
		name := fmt.Sprintf("projects/%s/subscriptions/%s", *project, s)
		sub := &pubsubpb.Subscription{Name: name, Topic: topicName, AckDeadlineSeconds: 10}
		if _, err := pubsubpb.NewSubscriberClient(conn).CreateSubscription(ctx, sub); err != nil {
			log.Fatalf("create subscription %s: %v", name, err)
		}
	}
	if *httpAddr != "" {
		http.HandleFunc("/publish", func(w http.ResponseWriter, r *http.Request) {
			var m struct {
				Data       []byte            `json:"data"`
				Attributes map[string]string `json:"attributes"`
			}
			if err := json.NewDecoder(r.Body).Decode(&m); err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			t := r.URL.Query().Get("topic")
			if t == "" {
				t = *topic
			}
			id := srv.Publish(fmt.Sprintf("projects/%s/topics/%s", *project, t), m.Data, m.Attributes)
			fmt.Fprintln(w, id)
		})
		go func() { log.Fatal(http.ListenAndServe(*httpAddr, nil)) }()
	}
	fmt.Printf("pubsub-emulator listening on %s (topic %s)\n", srv.Addr, topicName)
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
	<-stop
}
