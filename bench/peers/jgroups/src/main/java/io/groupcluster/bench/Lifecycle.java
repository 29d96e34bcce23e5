package io.groupcluster.bench;

import java.io.File;
import java.io.InputStream;
import java.io.OutputStream;
import org.jgroups.BytesMessage;
import org.jgroups.JChannel;
import org.jgroups.Message;
import org.jgroups.Receiver;
import org.jgroups.View;
import org.jgroups.util.MessageBatch;
import org.jgroups.util.UUID;

/**
 * JGroups 5 member or joiner of the join and state-transfer workloads (see LifecycleCore):
 * {@code java -cp ... io.groupcluster.bench.Lifecycle CONFIG.xml CLUSTER member|join [options]}. JGroups 5 has
 * no FLUSH (removed in 5.0), so its joins are plain GMS joins; the state comes from pbcast.STATE.
 */
public final class Lifecycle implements Receiver {
    private final LifecycleCore core;

    private Lifecycle(LifecycleCore core) {
        this.core = core;
    }

    @Override
    public void receive(Message msg) {}

    @Override
    public void receive(MessageBatch batch) {}

    @Override
    public void viewAccepted(View view) {
        core.viewSize(view.size());
    }

    @Override
    public void getState(OutputStream out) throws Exception {
        core.writeState(out);
    }

    @Override
    public void setState(InputStream in) throws Exception {
        core.readState(in);
    }

    public static void main(String[] args) throws Exception {
        if (args.length < 3) {
            System.err.println("usage: Lifecycle CONFIG.xml CLUSTER member|join [--members N] [--rate R] "
                    + "[--state-bytes S] [--timeout SECONDS]");
            System.exit(2);
        }
        LifecycleCore core = LifecycleCore.parse(java.util.Arrays.copyOfRange(args, 2, args.length));
        JChannel ch = new JChannel(new File(args[0]).getPath());
        ch.setReceiver(new Lifecycle(core));
        // Asked for when connect gives the channel its address, just before the stack starts: where our
        // member's history records "start" (reported as stack_start_ms, for the record).
        ch.addAddressGenerator(() -> {
            core.stackStarting();
            return UUID.randomUUID();
        });
        // A failed connect (e.g. a state transfer whose provider left) must end the JVM: its other threads are not
        // daemons, and the suite reads this process's results until it exits.
        int code;
        try {
            code = run(core, args[1], ch);
        } catch (Throwable t) {
            t.printStackTrace();
            code = 1;
        }
        System.exit(code);
    }

    private static int run(LifecycleCore core, String cluster, JChannel ch) throws Exception {
        return core.run(cluster, new LifecycleCore.Channel() {
            @Override
            public void connect(String cluster, boolean withState, long timeoutMs) throws Exception {
                if (withState) ch.connect(cluster, null, timeoutMs);
                else ch.connect(cluster);
            }

            @Override
            public void multicast(byte[] payload) throws Exception {
                ch.send(new BytesMessage(null, payload));
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
    }
}
