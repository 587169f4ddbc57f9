package waypost.tests.eureka;

import java.util.List;
import java.util.Map;
import java.util.TreeMap;

import org.springframework.boot.SpringApplication;
import org.springframework.boot.autoconfigure.SpringBootApplication;
import org.springframework.cloud.client.ServiceInstance;
import org.springframework.cloud.client.discovery.DiscoveryClient;
import org.springframework.context.ConfigurableApplicationContext;

/**
 * A stock Spring Cloud Eureka client: it registers itself (its gRPC port in metadata gRPC_port, set by the test
 * harness on the command line) and prints, once a second, one JSON line per watched app with what Spring's own
 * DiscoveryClient sees: {"app": "GREETER", "instances": [{"host", "port", "instanceId", "metadata"}]}.
 */
@SpringBootApplication
public class EurekaClientApp {
    public static void main(String[] args) throws InterruptedException {
        ConfigurableApplicationContext ctx = SpringApplication.run(EurekaClientApp.class, args);
        DiscoveryClient discovery = ctx.getBean(DiscoveryClient.class);
        String[] apps = ctx.getEnvironment().getProperty("watch.apps", "").split(",");
        System.out.println("{\"ready\": true}");
        System.out.flush();
        while (true) {
            for (String app : apps) {
                if (!app.isBlank()) {
                    System.out.println(line(app, discovery.getInstances(app)));
                }
            }
            System.out.flush();
            Thread.sleep(500);
        }
    }

    static String line(String app, List<ServiceInstance> instances) {
        StringBuilder out = new StringBuilder("{\"app\": ").append(quote(app)).append(", \"instances\": [");
        for (int i = 0; i < instances.size(); i++) {
            ServiceInstance si = instances.get(i);
            if (i > 0) {
                out.append(", ");
            }
            out.append("{\"host\": ").append(quote(si.getHost()))
               .append(", \"port\": ").append(si.getPort())
               .append(", \"instanceId\": ").append(quote(String.valueOf(si.getInstanceId())))
               .append(", \"metadata\": {");
            boolean first = true;
            for (Map.Entry<String, String> e : new TreeMap<>(si.getMetadata()).entrySet()) {
                if (!first) {
                    out.append(", ");
                }
                first = false;
                out.append(quote(e.getKey())).append(": ").append(quote(e.getValue()));
            }
            out.append("}}");
        }
        return out.append("]}").toString();
    }

    static String quote(String s) {
        StringBuilder out = new StringBuilder("\"");
        for (char c : s.toCharArray()) {
            if (c == '"' || c == '\\') {
                out.append('\\').append(c);
            } else if (c < 0x20) {
                out.append(String.format("\\u%04x", (int) c));
            } else {
                out.append(c);
            }
        }
        return out.append('"').toString();
    }
}
