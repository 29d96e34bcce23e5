package io.groupcluster.bench;

import java.io.File;
import org.jgroups.JChannel;
import org.jgroups.Message;
import org.jgroups.ReceiverAdapter;
import org.jgroups.View;

/**
 * JGroups 2.12 member or joiner of the join workloads (see LifecycleCore), through the 2.12 API:
 * {@code java -cp ... io.groupcluster.bench.Lifecycle212 CONFIG.xml CLUSTER member|join [options]}. With
 * pbcast.FLUSH in the stack (conf/jgroups212-flush.xml) every join is flushed, as on our vsync stack.
 * State transfer is not measured on 2.12.
 */
public final class Lifecycle212 extends ReceiverAdapter {
    private final LifecycleCore core;

    private Lifecycle212(LifecycleCore core) {
        this.core = core;
    }

    @Override
    public void receive(Message msg) {}

    @Override
    public void viewAccepted(View view) {
        core.viewSize(view.size());
    }

    public static void main(String[] args) throws Exception {
        if (args.length < 3) {
            System.err.println("usage: Lifecycle212 CONFIG.xml CLUSTER member|join [--members N] [--rate R] "
                    + "[--timeout SECONDS]");
            System.exit(2);
        }
        LifecycleCore core = LifecycleCore.parse(java.util.Arrays.copyOfRange(args, 2, args.length));
        if (core.stateBytes > 0) {
            System.err.println("Lifecycle212: state transfer is not measured on JGroups 2.12");
            System.exit(2);
        }
        JChannel ch = new JChannel(new File(args[0]));
        ch.setReceiver(new Lifecycle212(core));
        int code = core.run(args[1], new LifecycleCore.Channel() {
            @Override
            public void connect(String cluster, boolean withState, long timeoutMs) throws Exception {
                ch.connect(cluster);
            }

            @Override
            public void multicast(byte[] payload) throws Exception {
                ch.send(new Message(null, null, payload));
            }

            @Override
            public void disconnect() {
                ch.disconnect();
            }

            @Override
            public void close() {
                ch.close();
            }
        });
        System.exit(code);
    }
}
